#!/usr/bin/env bash
# Source this on the H200 host (the device tool's machine) from the repository root:
#   source scripts/gpu/setup.sh [WHEEL_DIR ...]
# It unpacks the GL loaders carried in .gl (EGL for MuJoCo), installs the wheels carried in the
# given folders (default .whl: diffusers, metaworld, mujoco 3.3.0 and small deps, made by
# ../shared/gpu-wheelhouse.sh) into /tmp/site, and exports what rendering and imports need.
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
