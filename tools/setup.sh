#!/usr/bin/env bash
# For a GPU host without a package index: source this from the repository root,
#   source tools/setup.sh [WHEEL_DIR ...]
# It unpacks GL loader .deb files brought along in .gl (EGL for MuJoCo), installs the wheels brought along
# in the given folders (default .whl: diffusers, metaworld, mujoco 3.3.0 and small deps) into /tmp/site,
# and exports what rendering and imports need. A host with pip access needs none of it: `pip install -e .`.
if [ -d .gl ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
dirs=("$@"); [ ${#dirs[@]} -eq 0 ] && dirs=(.whl)
for d in "${dirs[@]}"; do
  [ -d "$d" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$d"/*.whl
done
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl PYTHONUNBUFFERED=1
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
alias worldloop="python3 -m worldloop"
