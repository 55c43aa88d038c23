"""The MoE combine (unpermute) on one GPU: index_add of 49152 x 4096 bf16 rows into 8192 rows
(index = argsort(top-6 experts) // 6), meshfuser (its sorted gather-sum kernel, and with
MESHFUSER_INDEX_ADD=aten ATen's atomics) against torch.index_add (eager, ATen's atomic kernel),
torch.compile, and a sort-based segmented sum composed from ATen ops (argsort + per-row counts +
segment_reduce); then the permutation (dispatch) gather, index_select of 8192 rows into 49152, as
meshfuser's row gather against eager and torch.compile. GB/s as a fraction of a device-to-device
copy. On the CPU it is a smoke run on a small shape."""
import os

import torch

from meshfuser import DataType, FusionDefinition
from common import print_table, time_ms, write_json


def sorted_index_add(base, index, src):
    """base.index_add(0, index, src) without atomics: sort the rows by destination, sum each run."""
    perm = torch.argsort(index, stable=True)
    counts = torch.bincount(index, minlength=base.shape[0])
    sums = torch.segment_reduce(src.index_select(0, perm).float(), "sum", lengths=counts, axis=0, unsafe=True)
    return (base.float() + sums).to(base.dtype)


def main():
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    tokens, hidden, experts, k = (8192, 4096, 64, 6) if cuda else (256, 128, 8, 2)
    gen = torch.Generator(device=dev).manual_seed(0)
    topk = torch.rand(tokens, experts, device=dev, generator=gen).topk(k, dim=1).indices
    index = torch.argsort(topk.reshape(-1), stable=True) // k
    src = torch.randn(tokens * k, hidden, dtype=dtype, device=dev, generator=gen)
    base = torch.zeros(tokens, hidden, dtype=dtype, device=dev)
    with FusionDefinition() as fd:
        tb = fd.define_tensor([-1, -1], dtype=DataType.BFloat16 if cuda else DataType.Float)
        ti = fd.define_tensor([-1], dtype=DataType.Int)
        ts = fd.define_tensor([-1, -1], dtype=DataType.BFloat16 if cuda else DataType.Float)
        fd.add_output(fd.ops.index_add(tb, 0, ti, ts))

    def eager(b, i, s):
        return b.index_add(0, i, s)

    compiled = torch.compile(eager)
    ref = base.double().index_add(0, index, src.double()).to(dtype)
    for name, out in [("meshfuser", fd.execute([base, index, src])[0]), ("sorted", sorted_index_add(base, index, src))]:
        torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-2, msg=lambda m: f"{name}: {m}")
    dst = torch.empty_like(src)
    t_copy = time_ms(lambda: dst.copy_(src))
    os.environ["MESHFUSER_INDEX_ADD"] = "aten"
    t_mf_aten = time_ms(lambda: fd.execute([base, index, src]))
    del os.environ["MESHFUSER_INDEX_ADD"]
    times = [("meshfuser", time_ms(lambda: fd.execute([base, index, src]))),
             ("meshfuser, MESHFUSER_INDEX_ADD=aten", t_mf_aten),
             ("eager", time_ms(lambda: eager(base, index, src))),
             ("torch.compile", time_ms(lambda: compiled(base, index, src))),
             ("sorted (ATen ops)", time_ms(lambda: sorted_index_add(base, index, src)))]
    # Bytes an atomic-free kernel must move: src and base read once, out written once, the index.
    bytes_moved = (src.numel() + 2 * base.numel()) * src.element_size() + 2 * index.numel() * 8
    copy_gbps = 2 * src.numel() * src.element_size() / t_copy / 1e6
    t_mf = times[0][1]
    rows = [{"impl": n, "ms": t, "GB/s": bytes_moved / t / 1e6, "of_copy_bw": bytes_moved / t / 1e6 / copy_gbps,
             "meshfuser_speedup": t / t_mf} for n, t in times]
    rows.append({"impl": "d2d copy", "ms": t_copy, "GB/s": copy_gbps, "of_copy_bw": 1.0})
    device = torch.cuda.get_device_name() if cuda else "cpu"
    print_table(f"index_add {tokens * k}x{hidden} {dtype} into {tokens} rows, {device}", rows,
                ["impl", "ms", "GB/s", "of_copy_bw", "meshfuser_speedup"])
    gather_rows = permutation_gather(src, index, copy_gbps, device)
    write_json("index_add.json", {"device": device, "rows": rows, "gather": gather_rows})


def permutation_gather(routed, index, copy_gbps, device):
    """index_select(x, 0, token_of): every token's k copies, in expert order (the dispatch)."""
    x = routed[: int(index.max()) + 1].clone()
    with FusionDefinition() as fd:
        tx = fd.define_tensor([-1, -1], dtype=DataType.BFloat16 if x.is_cuda else DataType.Float)
        ti = fd.define_tensor([-1], dtype=DataType.Int)
        fd.add_output(fd.ops.index_select(tx, 0, ti))

    def eager(t, i):
        return t.index_select(0, i)

    compiled = torch.compile(eager)
    assert torch.equal(fd.execute([x, index])[0], eager(x, index))
    times = [("meshfuser", time_ms(lambda: fd.execute([x, index]))), ("eager", time_ms(lambda: eager(x, index))),
             ("torch.compile", time_ms(lambda: compiled(x, index)))]
    bytes_moved = 2 * index.numel() * x.shape[1] * x.element_size() + index.numel() * 8
    rows = [{"impl": n, "ms": t, "GB/s": bytes_moved / t / 1e6, "of_copy_bw": bytes_moved / t / 1e6 / copy_gbps,
             "meshfuser_speedup": t / times[0][1]} for n, t in times]
    print_table(f"index_select of {index.numel()} rows of {x.shape[1]} {x.dtype} from {x.shape[0]}, {device}", rows,
                ["impl", "ms", "GB/s", "of_copy_bw", "meshfuser_speedup"])
    return rows


if __name__ == "__main__":
    main()
