"""How much faster than `torch.mm` can a bf16 GEMM of the Llama block run with another cuBLASLt
algorithm? This bounds what choosing GEMM algorithms ourselves could win (issue 25's ceiling):
for each GEMM shape of the block (forward, and the backward's input and weight gradients), it asks
cuBLASLt's heuristic for its candidates, checks each one's result against torch.mm, times each with
CUDA events and prints the best candidate's speed-up over torch.mm.

cuBLASLt is reached through ctypes (the library torch already loaded), so nothing is compiled.
    python benchmarks/gemm_algorithms.py [--seq 8192] [--candidates 32]
"""
import argparse
import ctypes

import torch

from common import time_ms

# cuBLAS / CUDA enum values (cublasLt.h, library_types.h)
COMPUTE_32F = 68
R_32F, R_16BF = 0, 14
OP_N, OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
WORKSPACE_BYTES = 32 << 20


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def load_cublaslt():
    torch.mm(torch.ones(16, 16, device="cuda", dtype=torch.bfloat16),
             torch.ones(16, 16, device="cuda", dtype=torch.bfloat16))
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise SystemExit("libcublasLt not found")


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} returned cuBLAS status {status}")


class LtGemm:
    """Row-major out[M, N] = a_op[M, K] @ b_op[K, N] through cuBLASLt, where a and b are given as
    stored (possibly transposed). Column-major view: out^T = b_op^T @ a_op^T."""

    def __init__(self, lt, handle, a, trans_a, b, trans_b, out):
        self.lt, self.handle, self.a, self.b, self.out = lt, handle, a, b, out
        vp = ctypes.c_void_p
        self.desc = vp()
        check(lt.cublasLtMatmulDescCreate(ctypes.byref(self.desc), COMPUTE_32F, R_32F), "MatmulDescCreate")
        # Column-major first operand is b (row-major b^T), second is a.
        op_first = ctypes.c_int32(OP_T if trans_b else OP_N)
        op_second = ctypes.c_int32(OP_T if trans_a else OP_N)
        for attribute, op in ((DESC_TRANSA, op_first), (DESC_TRANSB, op_second)):
            check(lt.cublasLtMatmulDescSetAttribute(self.desc, attribute, ctypes.byref(op), ctypes.c_size_t(4)),
                  "MatmulDescSetAttribute")
        self.layouts = []
        for t in (b, a, out):  # a row-major [r, c] tensor is a column-major [c, r] matrix, ld c
            lay = vp()
            r, c = t.shape
            check(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lay), R_16BF, ctypes.c_uint64(c),
                                                ctypes.c_uint64(r), ctypes.c_int64(c)), "LayoutCreate")
            self.layouts.append(lay)
        self.pref = vp()
        check(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)), "PreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        check(lt.cublasLtMatmulPreferenceSetAttribute(self.pref, PREF_MAX_WORKSPACE_BYTES,
                                                      ctypes.byref(ws), ctypes.c_size_t(8)), "PreferenceSetAttribute")
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def candidates(self, count):
        results = (HeuristicResult * count)()
        returned = ctypes.c_int(0)
        first, second, out = self.layouts
        check(self.lt.cublasLtMatmulAlgoGetHeuristic(self.handle, self.desc, first, second, out, out,
                                                     self.pref, count, results, ctypes.byref(returned)),
              "AlgoGetHeuristic")
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def run(self, candidate):
        first, second, out = self.layouts
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        return self.lt.cublasLtMatmul(
            self.handle, self.desc, ctypes.byref(self.alpha), ctypes.c_void_p(self.b.data_ptr()), first,
            ctypes.c_void_p(self.a.data_ptr()), second, ctypes.byref(self.beta),
            ctypes.c_void_p(self.out.data_ptr()), out, ctypes.c_void_p(self.out.data_ptr()), out,
            ctypes.byref(candidate.algo), ctypes.c_void_p(self.workspace.data_ptr()),
            ctypes.c_size_t(WORKSPACE_BYTES), stream)


def shapes(seq, hidden, kv, ffn):
    """(name, M, K, N, trans_a, trans_b): the block's GEMMs as y = x @ W^T (weights stored [out, in])."""
    fwd = [("qkv", seq, hidden, hidden + 2 * kv), ("o", seq, hidden, hidden),
           ("gate+up", seq, hidden, 2 * ffn), ("down", seq, ffn, hidden)]
    rows = []
    for name, m, k, n in fwd:
        rows.append((f"{name} fwd", m, k, n, False, True))        # x[m,k] @ W[n,k]^T
        rows.append((f"{name} dgrad", m, n, k, False, False))     # dy[m,n] @ W[n,k]
        rows.append((f"{name} wgrad", n, m, k, True, False))      # dy[m,n]^T @ x[m,k]
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--kv", type=int, default=1024, help="KV features (8 heads of 128)")
    parser.add_argument("--ffn", type=int, default=14336)
    parser.add_argument("--candidates", type=int, default=32)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemm_algorithms.py times cuBLASLt's algorithms: it needs a CUDA GPU")
    lt = load_cublaslt()
    handle = ctypes.c_void_p()
    check(lt.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.version.cuda} / {torch.__version__}")
    print(f"{'GEMM':<14}{'M x K x N':>22}{'torch.mm ms':>13}{'TF/s':>7}{'#cand':>7}{'best ms':>9}"
          f"{'cand#':>7}{'speed-up':>10}{'heur#0 ms':>11}")
    total_mm = total_best = 0.0
    for name, m, k, n, ta, tb in shapes(args.seq, args.hidden, args.kv, args.ffn):
        a = torch.randn(*((k, m) if ta else (m, k)), device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(*((n, k) if tb else (k, n)), device="cuda", dtype=torch.bfloat16, generator=gen)
        a_op, b_op = (a.t() if ta else a), (b.t() if tb else b)
        reference = torch.mm(a_op, b_op)
        mm_ms = time_ms(lambda: torch.mm(a_op, b_op))
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        gemm = LtGemm(lt, handle, a, ta, b, tb, out)
        timed = []
        for i, cand in enumerate(gemm.candidates(args.candidates)):
            out.zero_()
            if gemm.run(cand) != 0:
                continue
            torch.cuda.synchronize()
            err = (out.float() - reference.float()).abs().max().item()
            if err > 0.05 * reference.float().abs().max().item():
                print(f"  {name}: candidate {i} disagrees with torch.mm (max error {err:.3g}), skipped")
                continue
            timed.append((time_ms(lambda: gemm.run(cand)), i))
        if not timed:
            print(f"{name:<14} no candidate ran")
            continue
        best_ms, best_i = min(timed)
        first_ms = next((t for t, i in timed if i == 0), float("nan"))
        total_mm += mm_ms
        total_best += min(best_ms, mm_ms)
        tflops = 2 * m * k * n / mm_ms / 1e9
        print(f"{name:<14}{f'{m} x {k} x {n}':>22}{mm_ms:>13.3f}{tflops:>7.0f}{len(timed):>7}{best_ms:>9.3f}"
              f"{best_i:>7}{mm_ms / best_ms:>9.3f}x{first_ms:>11.3f}")
    print(f"all GEMMs of one fwd+bwd step: torch.mm {total_mm:.3f} ms, best candidate per GEMM "
          f"{total_best:.3f} ms ({total_mm / total_best:.3f}x)")


if __name__ == "__main__":
    main()
