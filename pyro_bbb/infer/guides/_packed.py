"""A guide's parameters of one kind stored end to end in one buffer, each still its own parameter.

:class:`PackedParameters` takes tensors (a mean-field guide's ``locs.<site>``, say) and moves
their values into one flat buffer, ``(d,)``, with each tensor's data a view of its stretch:
``tensor.data = buffer[a:b].view(shape)``, the way Pyro itself updates a ``PyroParam``'s
value. Every tensor stays the object it was, under its own name: Pyro's param store,
``named_parameters()``, ``state_dict``, an optimiser and a checkpoint see the same tensors,
values and shapes as before; an update of one (the optimiser's, ``load``'s ``copy_``) is an
update of its stretch of the buffer. What gains is arithmetic over every site at once: a
softplus, a draw or a KL of the whole network is then one call over the buffer instead of
one per site, with no copy.

Whatever gives a tensor other data (``module.to(device)``, Pyro's param store loaded or
cleared and set again, a deep copy) leaves it outside the buffer; :meth:`PackedParameters.holds`
sees that, and the owner packs again (values kept). Nothing here knows of guides.

A tensor saved alone by ``torch.save`` writes the storage it is a view of: a packed
parameter saved on its own writes its whole buffer (this package's ``save`` and checkpoints
write every parameter, so the buffer once).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["PackedParameters"]


class PackedParameters:
    """``tensors`` moved into one flat buffer, each tensor's data a view of its stretch.

    Args:
        tensors: Leaf tensors (parameters) of one dtype and device, in the buffer's order;
            their values are copied in.

    Raises:
        ValueError: If ``tensors`` is empty, mixes dtypes or devices, or holds a tensor
            that is not dense.
    """

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        if not tensors:
            raise ValueError("tensors must hold at least one tensor, got none")
        first = tensors[0]
        for tensor in tensors:
            if tensor.layout is not torch.strided:
                raise ValueError(f"tensors must be dense, got one with layout {tensor.layout}")
            if tensor.dtype != first.dtype or tensor.device != first.device:
                raise ValueError(
                    "tensors must share one dtype and device, got "
                    f"{first.dtype} on {first.device} and {tensor.dtype} on {tensor.device}"
                )
        self.tensors = tuple(tensors)
        self.sizes = tuple(t.numel() for t in tensors)
        #: The buffer, ``(d,)``: every tensor's values, end to end.
        self.buffer = torch.empty(sum(self.sizes), dtype=first.dtype, device=first.device)
        offset = 0
        with torch.no_grad():
            for tensor, size in zip(self.tensors, self.sizes, strict=True):
                piece = self.buffer[offset : offset + size]
                piece.copy_(tensor.reshape(-1))
                tensor.data = piece.view(tensor.shape)
                offset += size
        self._addresses = [t.data_ptr() for t in self.tensors]

    def holds(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether ``tensors`` are the packed tensors, in order, each still in the buffer."""
        if len(tensors) != len(self.tensors):
            return False
        for tensor, packed, address in zip(tensors, self.tensors, self._addresses, strict=True):
            if tensor is not packed or tensor.data_ptr() != address:
                return False
        return True
