#!/usr/bin/env bash
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 MESHFUSER_NO_INSTALL=1
echo "CXX=${CXX:-unset}"; which python3; python3 -c "import torch; print(torch.__version__)"
rm -rf build
start=$(date +%s)
timeout 280 python3 -m pip install --no-build-isolation --no-deps --target /tmp/pt-image . > $OUT/pip_image.log 2>&1
echo "pip install with the image's CXX: rc=$? after $(( $(date +%s) - start )) s"
grep -E "does not import|Segmentation|Error|error:" $OUT/pip_image.log | head -8
(cd /tmp && PYTHONPATH=/tmp/pt-image timeout 60 python3 -c "import meshfuser; print('import ok:', meshfuser.__file__)"; echo "import rc=$?")
start=$(date +%s)
CXX=/usr/bin/g++ timeout 280 python3 -m pip install --no-build-isolation --no-deps --target /tmp/pt-sys . > $OUT/pip_sys.log 2>&1
echo "pip install with CXX=/usr/bin/g++: rc=$? after $(( $(date +%s) - start )) s"
(cd /tmp && PYTHONPATH=/tmp/pt-sys timeout 60 python3 -c "import meshfuser, torch; print('import ok', meshfuser.cmake_prefix_path)"; echo "import rc=$?")
