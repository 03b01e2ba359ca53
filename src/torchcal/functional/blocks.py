"""Building blocks of a loss in log-space, for the modules of :mod:`torchcal.losses` and a
loss of your own: the reductions, the argument checks, the target's log-probabilities, a safe
power and the float32 computation context.  They are helpers, not losses, so they are not in
:mod:`torchcal.functional`'s list of names.

>>> import torch
>>> from torchcal.functional.blocks import reduce_loss, target_log_probs
>>> z, y = torch.zeros(2, 4), torch.tensor([1, 3])
>>> _, log_p_y, _, valid = target_log_probs(z, y, -100)
>>> reduce_loss(-log_p_y, valid, "mean")
tensor(1.3863)
"""

from ._common import no_autocast, safe_pow
from ._loss_utils import REDUCTIONS, check_loss_args, reduce_loss, target_log_probs
from ._plain import check_batch_reduction

__all__ = ["REDUCTIONS", "check_batch_reduction", "check_loss_args", "no_autocast",
           "reduce_loss", "safe_pow", "target_log_probs"]
