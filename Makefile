# Two entry points: `make demo` (the main job on the tiny-cpu preset) and `make test`.
# Both create .venv when it is absent and install worldloop into it, with the LIBERO extra (its tests need it).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DEMO   ?= runs/demo
# Software OpenGL through EGL renders MuJoCo on machines without a GPU; the GPU host sets egl too.
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= $(MUJOCO_GL)

# torch: keep one the user already has in the venv; otherwise the build that lies on this kind of
# machine's disk (x86_64: 2.14.1, aarch64: 2.9.1).
ARCH := $(shell uname -m)
ifeq ($(ARCH),aarch64)
TORCH_PINS := torch==2.9.1 torchvision==0.24.1
else
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
endif

.PHONY: demo test render-deps clean-demo

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch, torchvision" 2>/dev/null || $(PY) -m pip install -q $(TORCH_PINS)
	$(PY) -m pip install -q -e '.[test,libero]'
	$(PY) -m pip install -q --no-deps rlinf-libero==0.1.3
	@touch $@

render-deps: $(VENV)/.installed
	@if $(PY) -c "import mujoco; c = mujoco.GLContext(16, 16); c.make_current(); c.free()" 2>/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing EGL/OpenGL libraries for headless MuJoCo rendering (libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri >/dev/null; \
	  $(PY) -c "import mujoco; c = mujoco.GLContext(16, 16); c.make_current(); c.free()" || { echo "MuJoCo still cannot open an $(MUJOCO_GL) context"; exit 1; }; \
	else \
	  echo "MuJoCo cannot render headless: install libegl1 libgl1 libegl-mesa0 libgl1-mesa-dri (Debian/Ubuntu) as root, then rerun"; exit 1; \
	fi

demo: $(VENV)/.installed render-deps
	$(VENV)/bin/worldloop loop --out $(DEMO)

test: $(VENV)/.installed render-deps
	$(PY) -m pytest
