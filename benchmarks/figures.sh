#!/usr/bin/env bash
# Every figure the open performance issues quote, in one GPU call (about 8 minutes on one H200):
# the GPU tests of generated kernels and attention, then the benchmarks with their kernel
# breakdowns. Logs go to $OUT (or ./figures) and a summary to stdout.
#   bash benchmarks/figures.sh            # all
#   bash benchmarks/figures.sh llama moe  # some: tests tests1 gpt llama backend moe rope gather
# (tests1: the blocks' and the MoE layer's training tests on one CUDA rank, against PyTorch)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
out=${OUT:-figures}
mkdir -p "$out"
wanted=${*:-tests tests1 gpt llama backend moe rope gather}
t0=$SECONDS
step() {  # name, command...: runs it into $out/name.log, prints its tables
  local name=$1; shift
  case " $wanted " in *" $name "*) ;; *) return ;; esac
  "$@" > "$out/$name.log" 2>&1
  echo "== $name (exit $?, $((SECONDS - t0)) s)"
  grep -v "^\s*$" "$out/$name.log" | grep -v "Warning\|warn\|top kernels\|top aten\|return Variable" | cut -c1-300 | tail -40
}
step tests timeout 300 python -m pytest tests/python/test_codegen_gpu.py tests/python/test_codegen_resize.py \
  tests/python/test_attention.py tests/python/test_block_kernels.py tests/python/test_row_gather.py\
  tests/python/test_outer_reduction_split.py tests/python/test_inplace_outputs.py tests/python/test_release_inputs.py tests/python/test_gemm_accumulate.py -q -p no:cacheprovider --timeout 120 -rf
step tests1 timeout 300 python -m torch.distributed.run --nproc_per_node=1 --standalone -m pytest -q -p no:cacheprovider \
  --timeout 200 tests/python/multidevice/test_gpt_block_training.py tests/python/multidevice/test_llama_block_training.py \
  tests/python/multidevice/test_moe_expert_parallel.py tests/python/multidevice/test_moe_layer.py -rf
step gpt timeout 200 python benchmarks/transformer_block.py --block gpt --breakdown --segments
step llama timeout 200 python benchmarks/transformer_block.py --block llama --breakdown --segments
step backend timeout 200 python benchmarks/compile_backend.py --breakdown
step moe timeout 200 python benchmarks/moe_layer.py --breakdown
step rope timeout 100 python benchmarks/rope.py
step gather bash -c 'cd benchmarks && timeout 150 python index_add.py'
