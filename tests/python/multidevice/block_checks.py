"""Checks shared by the block training tests: a bf16 step against the float32 PyTorch reference."""
import torch


def assert_bf16_step_close(output, grads, names, split, expected_out, expected_grads, dy, mesh, rank):
    """output and grads (one per name, this rank's shard where `split` names the axis) are bf16 and
    within 5% of the reference's scale (the larger of the expected value's and dy's)."""
    def close(actual, want, what):
        assert actual.dtype == torch.bfloat16, what
        error = (actual.float().cpu() - want).abs().max().item()
        scale = max(want.abs().max().item(), dy.float().abs().max().item())
        assert error <= 0.05 * scale, f"{what}: max error {error} (scale {scale})"

    close(output, expected_out, "output")
    for n, actual in zip(names, grads):
        want = expected_grads[n]
        if n in split:
            want = mesh.shard_tensor(want, split[n], rank)
        close(actual, want, f"grad of {n}")
