"""Indexing's backward on the meta device as the CPU runs it.

`x[index]` (aten::index.Tensor) records IndexBackward0, whose formula
(torch/csrc/autograd/FunctionsManual.cpp index_backward, PyTorch 2.11)
makes the gradient as zeros of x's shape, then scatters the incoming
gradient into it: in place (_index_put_impl_, accumulate) for a plain
tensor, out of place (index_put: a clone of the zeros, which are then
freed) for a "subclass-like" one, whose key set the meta backend is part of
(kTensorSubclassLike). A trace on the meta device would so hold two
gradients of x's shape for an instant where the CPU holds one: at a
mixture-of-experts layer's backward (transformers' grouped_mm experts put
the tokens back in order with weighted_out[inv_perm]) that instant can be
the step's peak.

register() puts a Meta kernel for aten::index_put (out of place) that,
inside IndexBackward0 (torch._C._current_autograd_node), scatters into the
zeros in place and returns them, as the CPU's path does, and elsewhere does
what the op's CompositeExplicitAutograd kernel does (a clone, then
index_put_). The autograd node itself is PyTorch's: what it saves, and when
(the indices, packed before the forward's output is made, where
checkpointing's recomputation stops), is unchanged. For a CPU target only:
CUDA's accumulating index_put_ sorts the indices (index_put_with_sort_stub),
which this does not imitate. PyTorch 2.11's CPU step allocates this to the
byte (tests/pytorch/hf_trace_test.py, Mixtral under checkpointing)."""
import torch

OPS = ("aten::index_put",)


def _index_put(self, indices, values, accumulate=False):
    node = torch._C._current_autograd_node()
    if node is not None and node.name() == "IndexBackward0":
        return torch.ops.aten._index_put_impl_.default(self, indices, values, accumulate, False)
    return torch.ops.aten.index_put_.default(self.clone(memory_format=torch.preserve_format), indices, values,
                                             accumulate)


def register():
    """The kernel, for as long as the returned Library lives."""
    meta = torch.library.Library("aten", "IMPL", "Meta")
    meta.impl("index_put", _index_put)
    return meta
