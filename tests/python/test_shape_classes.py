"""Shape classes (runtime/shape_class.h): one compiled program per class of inputs, kernels whose
source does not depend on the outer extents, bounded caches, and MESHFUSER_DUMP=recompile. Runs on
CPU: kernel sources come from fd.cuda_kernels on meta tensors; results from the ATen path."""
import os

import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition

import norm_patterns

BF = DataType.BFloat16


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")



def _definitions():
    """(name, definition builder, inputs for `rows` rows as meta tensors)."""
    cols = 4096

    def pattern(name):
        def build(fd):
            getattr(norm_patterns, name)(fd, BF, -1, cols)
        return build

    def pointwise(fd):
        x = fd.define_tensor([-1, cols], dtype=BF)
        b = fd.define_tensor([cols], dtype=BF)
        y = fd.ops.gelu(fd.ops.add(fd.ops.cast(x, DataType.Float), fd.ops.cast(b, DataType.Float)))
        fd.add_output(fd.ops.cast(y, BF))

    def row_sum(fd):
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.define_tensor([-1, cols], dtype=BF), DataType.Float), [1]))

    def col_sum(fd):  # a bias gradient: the varying extent is the reduced one
        fd.add_output(fd.ops.sum(fd.ops.cast(fd.define_tensor([-1, cols], dtype=BF), DataType.Float), [0]))

    mat = lambda rows: [_meta(rows, cols)]  # noqa: E731
    vec = lambda: _meta(cols)  # noqa: E731
    return [
        ("softmax", pattern("softmax"), mat),
        ("rms_norm", pattern("rms_norm"), lambda rows: [_meta(rows, cols), vec()]),
        ("layer_norm", pattern("layer_norm"), lambda rows: [_meta(rows, cols), vec(), vec()]),
        ("pointwise", pointwise, lambda rows: [_meta(rows, cols), vec()]),
        ("row_sum", row_sum, mat),
        ("col_sum", col_sum, mat),
    ]


@pytest.mark.parametrize("name,build,inputs", _definitions(), ids=[d[0] for d in _definitions()])
def test_one_source_for_every_row_count_of_a_class(name, build, inputs):
    meshfuser._C.clear_caches()
    with FusionDefinition() as fd:
        build(fd)
    first = fd.cuda_kernels(inputs(1000))
    assert first, "the definition generates kernels"
    before = meshfuser._C.compile_counters()
    for rows in (1234, 8192, 1000 + 7 * 64, 24576):
        assert fd.cuda_kernels(inputs(rows)) == first, f"rows={rows}"
    after = meshfuser._C.compile_counters()
    assert after["executors"] == before["executors"], "the program is reused across extents"
    assert after["sources"] == before["sources"], "no new kernel source, so no new compile on a GPU"
    assert after["kernels"] > before["kernels"], "each new extent regenerates the (cheap) text"
    assert fd._handle.num_executors() == 1 and fd._handle.executors_built() == 1


def test_what_changes_the_code_is_a_new_source():
    meshfuser._C.clear_caches()
    with FusionDefinition() as fd:
        norm_patterns.softmax(fd, BF, -1, -1)
    narrow = fd.cuda_kernels([_meta(1000, 4096)])
    wide = fd.cuda_kernels([_meta(1000, 16384)])  # another row length: other loops
    assert narrow != wide
    assert fd._handle.executors_built() == 1  # still one program: only the kernel differs


def test_results_across_extents_on_one_executor():
    meshfuser._C.clear_caches()
    with FusionDefinition() as fd:
        norm_patterns.layer_norm(fd, DataType.Float, -1, 64)
    for rows in (3, 17, 64, 5, 128):
        torch.manual_seed(rows)
        ins = norm_patterns.make_inputs("layer_norm", torch.float32, rows, 64)
        out = fd.execute(ins)
        ref = norm_patterns.torch_reference("layer_norm", ins, torch.float32)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r)
    assert fd._handle.executors_built() == 1


def _exp_add():
    with FusionDefinition() as fd:
        a, b = fd.define_tensor([-1, -1]), fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.exp(fd.ops.add(a, b)))
    return fd


def test_executor_cache_evicts_least_recently_used():
    meshfuser._C.clear_caches()
    old = meshfuser.set_cache_limits()
    try:
        meshfuser.set_cache_limits(executors=2)
        fd = _exp_add()
        y = torch.randn(4, 6)
        classes = [torch.randn(4, 6), torch.randn(6, 4).t(), torch.randn(4, 12)[:, ::2]]  # 3 layouts
        for x in classes:
            torch.testing.assert_close(fd.execute([x, y])[0], torch.exp(x + y))
        assert fd._handle.num_executors() == 2 and fd._handle.executors_built() == 3
        assert "HostProgram" in fd.host_program()  # the last program stays readable
        fd.execute([classes[2], y])  # still cached
        assert fd._handle.executors_built() == 3
        fd.execute([classes[0], y])  # evicted: compiled again
        assert fd._handle.executors_built() == 4 and fd._handle.num_executors() == 2
    finally:
        meshfuser.set_cache_limits(executors=old[0], kernel_modules=old[1])


def test_cache_limits_must_be_positive():
    with pytest.raises(meshfuser.Error, match="executors must be >= 1, got 0"):
        meshfuser.set_cache_limits(executors=0)
    with pytest.raises(meshfuser.Error, match="kernel_modules must be >= 1, got -3"):
        meshfuser.set_cache_limits(kernel_modules=-3)


def test_host_program_prints_the_segmentation():
    meshfuser._C.clear_caches()
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 256], dtype=BF)
        w = fd.define_tensor([512, 256], dtype=BF)
        h = fd.ops.linear(x, w)  # a GEMM: ATen
        fd.add_output(fd.ops.cast(fd.ops.relu(fd.ops.cast(h, DataType.Float)), BF))
    fd.cuda_kernels([_meta(100, 256), _meta(512, 256)])
    text = fd.host_program()
    assert "Segmentation (planned once per shape class) {" in text, text
    assert "piece 0 [linear]: ATen (" in text, text
    assert "[cast, relu, cast]: generated pointwise: vec 8" in text, text


def _dumped(caplog, topic):
    """Lines of one MESHFUSER_DUMP topic, as logged (meshfuser's output goes through `logging`)."""
    return [line for r in caplog.records if r.name == f"meshfuser.{topic}" for line in r.getMessage().splitlines()]


def test_recompile_dump_names_the_change(caplog, monkeypatch):
    meshfuser._C.clear_caches()
    monkeypatch.setenv("MESHFUSER_DUMP", "recompile")
    meshfuser._C.reload_options()
    try:
        fd = _exp_add()
        fd.execute([torch.randn(3, 4), torch.randn(3, 4)])
        fd.execute([torch.randn(5, 7), torch.randn(5, 7)])  # same class: nothing to say
        fd.execute([torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7)])
    except meshfuser.Error:
        pass  # a float64 input to a float definition is refused after the class is compiled
    finally:
        monkeypatch.delenv("MESHFUSER_DUMP")
        meshfuser._C.reload_options()
    lines = _dumped(caplog, "recompile")
    out = "\n".join(lines)
    assert lines[0] == "[meshfuser rank 0] recompile: first call of the definition", out
    assert len(lines) == 2, out
    assert "new shape class (input 0: Float on cpu, 2-D" in lines[1] and "-> Double on cpu" in lines[1], out


def test_recompile_dump_names_a_new_kernel_for_other_extents(caplog, monkeypatch):
    meshfuser._C.clear_caches()
    with FusionDefinition() as fd:
        norm_patterns.softmax(fd, BF, -1, -1)
    fd.cuda_kernels([_meta(1000, 4096)])
    monkeypatch.setenv("MESHFUSER_DUMP", "recompile")
    meshfuser._C.reload_options()
    try:
        fd.cuda_kernels([_meta(2000, 4096)])  # same kernel: silent
        fd.cuda_kernels([_meta(1000, 16384)])
    finally:
        monkeypatch.delenv("MESHFUSER_DUMP")
        meshfuser._C.reload_options()
    lines = _dumped(caplog, "recompile")
    assert len(lines) == 1, lines
    assert "inputs of sizes [[1000, 16384]] (planned for [[1000, 4096]]) need a new kernel: normalization:" in lines[0]


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.timeout(600)  # 20,000 calls: seconds alone, minutes on a loaded 2-core machine
def test_ten_thousand_shapes_keep_memory_flat():
    meshfuser._C.clear_caches()
    fd = _exp_add()
    with FusionDefinition() as norm:
        norm_patterns.softmax(norm, BF, -1, -1)
    for rows in range(2, 201):  # warm the allocator and the caches (rows=1 is another class: extent 1)
        fd.execute([torch.randn(rows, 3), torch.randn(rows, 3)])
        norm.cuda_kernels([_meta(rows, 1024)])
    start = _rss_mib()
    for rows in range(201, 10201):
        fd.execute([torch.ones(rows, 3), torch.ones(rows, 3)])
        norm.cuda_kernels([_meta(rows, 1024)])
    grown = _rss_mib() - start
    assert grown <= 20, f"resident memory grew {grown:.1f} MiB over 10,000 shapes"
    assert fd._handle.executors_built() == 1 and norm._handle.executors_built() == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["softmax", "rms_norm", "layer_norm", "layer_norm_backward", "transposed_add"])
def test_generated_kernels_across_row_counts_on_gpu(name):
    """One definition, many row counts: every call launches a generated kernel with its own count
    (no ATen fallback), the results match PyTorch, and no new program is built."""
    meshfuser._C.clear_caches()
    cols = 1024
    with FusionDefinition() as fd:
        getattr(norm_patterns, name)(fd, BF, -1, cols)
    built = None
    for rows in (64, 1000, 1237, 8, 4096, 1000, 333):
        torch.manual_seed(rows)
        ins = norm_patterns.make_inputs(name, torch.bfloat16, rows, cols, device="cuda")
        with meshfuser.Profiler() as prof:
            out = fd.execute(ins)
        assert "expr_eval" not in [k.scheduler for k in prof.profile.kernel_profiles], (rows, fd.host_program())
        ref = norm_patterns.torch_reference(name, ins, torch.bfloat16)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o.float(), r.float(), rtol=2e-2, atol=2e-2)
        built = built or fd._handle.executors_built()
    assert fd._handle.executors_built() == built == 1


def test_gpt_block_forward_sources_do_not_depend_on_the_sequence_length():
    """The GPT block with a symbolic sequence: the same kernels for every length, and the heads'
    permutes stay ATen views (a copy kernel would hold the sequence length in its text)."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import transformer_blocks as blocks

    meshfuser._C.clear_caches()
    fd = FusionDefinition()
    with fd:
        blocks.define_gpt_forward(fd, 1, -1, 4, 16, BF)

    def sources(seq):
        full = blocks.gpt_parameters(1, seq, 64, seed=0, dtype=torch.bfloat16)
        return fd.cuda_kernels([t.to("meta") for t in blocks.gpt_forward_inputs(full["x"], full)])

    first = sources(3000)  # lengths past the small-size bucket (128-thread pointwise blocks)
    assert len(first) == 4  # LayerNorm, LayerNorm with the residual add, GELU, the last add
    assert sources(3256) == first and sources(4104) == first
    assert "piece 0 [permute]: ATen (only views" in fd.host_program()
    assert fd._handle.executors_built() == 1
