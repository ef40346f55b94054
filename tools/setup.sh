#!/usr/bin/env bash
# For a GPU host without a package index: source this from the repository root,
#   source tools/setup.sh [WHEEL_DIR ...]
# It unpacks GL loader .deb files brought along in .gl (EGL for MuJoCo), installs the wheels brought along
# in the given folders (default .whl: diffusers, metaworld, mujoco 3.3.0 and small deps) into /tmp/site,
# extracts the site-packages archives (.tar.xz) found there too (LIBERO's, from tools/libero_carry.py),
# and exports what rendering and imports need. A host with pip access needs none of it: `pip install -e .`.
if [ -d .gl ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
dirs=("$@"); [ ${#dirs[@]} -eq 0 ] && dirs=(.whl)
mkdir -p /tmp/site
for d in "${dirs[@]}"; do
  [ -d "$d" ] || continue
  wheels=("$d"/*.whl)
  [ -e "${wheels[0]}" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}"
  for archive in "$d"/*.tar.xz; do
    [ -e "$archive" ] && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' "$archive" /tmp/site
  done
done
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl PYTHONUNBUFFERED=1
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
alias worldloop="python3 -m worldloop"
# MuJoCo's EGL needs the glvnd loader, which some images lack (an H100 one of 2026-12-07): say so now, not at the
# first import of Meta-World or LIBERO (PyOpenGL's "'NoneType' object has no attribute 'eglQueryString'")
if ! ldconfig -p | grep -q "libEGL.so.1 "; then
  echo "tools/setup.sh: no libEGL.so.1 on this host: MuJoCo cannot render; bring .gl (tools/README.md) and name it first" >&2
fi
