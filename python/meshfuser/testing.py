"""pytest helpers: the `multidevice_test` fixture (registered as a plugin through
tests' conftest or `-p meshfuser.testing`). Every rank seeds the RNG identically, so every rank
builds the same unsharded reference and checks its own shard."""
import os

import pytest
import torch

from . import _C
from .distributed import Communicator
from .fusion_definition import shard_tensor


class MultideviceTest:
    def __init__(self):
        self._comm = Communicator.instance()
        if torch.cuda.is_available() and os.environ.get("MESHFUSER_TEST_DEVICE", "cuda") == "cuda":
            self.device = torch.device("cuda", self.local_rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")

    @property
    def communicator(self):
        return self._comm

    @property
    def size(self):
        return self._comm.size()

    @property
    def rank(self):
        return self._comm.rank()

    @property
    def local_size(self):
        return self._comm.local_size()

    @property
    def local_rank(self):
        return self._comm.local_rank()

    def barrier(self):
        self._comm.barrier()

    def shard_tensor(self, t, dim_or_tv, mesh=None):
        if isinstance(dim_or_tv, int):
            return self.shard_tensor_1d(t, dim_or_tv, mesh)
        return shard_tensor(t, dim_or_tv, self.rank).to(self.device)

    def shard_tensor_1d(self, t, dim, mesh):
        return mesh.shard_tensor(t, dim, self.rank).to(self.device)


@pytest.fixture
def multidevice_test():
    torch.manual_seed(0)
    _C.clear_caches()
    return MultideviceTest()


@pytest.fixture(scope="session")
def setup_default_process_group():
    """nvFuser's fixture for tests that call torch.distributed directly (DTensor, device meshes):
    the default process group, initialized from the launcher's environment if nobody has yet."""
    from .distributed import _ensure_initialized
    _ensure_initialized()
    yield


def execute_with_plan(fd, inputs):
    """Runs fd on inputs; returns (outputs, [(kind, bytes_sent, bytes_received)] per communication
    this rank ran), what the plan tests assert."""
    from .profiler import Profiler
    with Profiler() as prof:
        outputs = fd.execute(inputs)
    comms = [(k.name.split()[0], k.bytes_sent, k.bytes_received)
             for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    return outputs, comms


def communication_kinds(names):
    """["Allreduce", ...] from profiler communication names ("Allreduce T2 <- T3 on DIDx ...")."""
    return [name.split()[0] for name in names]


def llama_decoder_layer(config):
    """A Hugging Face LlamaDecoderLayer with its rotary embedding, called as LlamaModel calls it
    (positions 0..seq-1); `transformers` is imported here, on first use."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    class LlamaLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = LlamaDecoderLayer(config, 0)
            self.rope = LlamaRotaryEmbedding(config)

        def forward(self, x):
            position_ids = torch.arange(x.shape[1], device=x.device)[None]
            out = self.layer(x, position_embeddings=self.rope(x, position_ids), position_ids=position_ids)
            return out[0] if isinstance(out, tuple) else out

    return LlamaLayer()
