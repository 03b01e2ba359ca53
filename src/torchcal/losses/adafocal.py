r"""AdaFocal (Ghosh, Schaaf, Gormley 2022): focal loss with a γ per confidence bin, moved by
validation calibration.

State: ``B`` bins with edges ``bin_edges`` (``B + 1`` values, always ``0`` first and ``1`` last)
and one ``γ_b`` per bin (``gammas``).  Before the first update the bins are equal-width
(``k/B``) and every ``γ_b = gamma_init`` (the first epoch is focal loss FL-1 by default).

Update (:meth:`AdaFocalLoss.update`, after each epoch or every ``update_every`` batches), from
the validation outputs:

1. top-1 confidences ``conf`` and correctness of the validation set are put into ``B``
   equal-mass bins (:func:`torchcal.metrics.binning.equal_mass_edges` /
   :func:`~torchcal.metrics.binning.bin_index`, right-closed, the same binning as AdaECE);
2. per bin the signed gap ``d_b = mean(conf) - accuracy`` (over-confident bins have
   ``d_b > 0``);
3. ``γ_b ← γ_b·exp(λ d_b)`` if ``γ_b > 0``, else ``γ_b ← γ_b·exp(-λ d_b)``;
4. if ``|γ_b| < S_th`` the sign flips: ``γ_b ← -S_th`` if it was positive, ``+S_th`` otherwise
   (``γ_b = 0`` becomes ``+S_th``);
5. clip to ``[γ_min, γ_max]``;
6. the bin ranges become the validation equal-mass edges (with 0 and 1 at the ends).

The equal-mass edges are torchcal's one definition (``e_k = s_{max(⌊kN/B⌋-1, 0)}`` of the
sorted confidences, every sample in exactly one bin); AdaFocal's published code instead copies
the focal-calibration code's ``e_k = s_{kN/B}``, which drops the smallest sample.

Confidences are ``exp(top - logsumexp(z))``; the published code takes
``exp(max log_softmax(z))``, which can differ by 1 ulp.  On heavily tied validation logits
(e.g. integer-rounded) that moves tied samples across bin edges, so the γ trajectory of
``edges="published"`` can drift from the published one (up to 0.73 in γ after 6 epochs in
the issue-24 measurement); the ulp matters only where a confidence lies on a bin edge.

``edges="published"`` reproduces the published code's bins exactly, to reproduce its γ
trajectory: the edges are ``np.interp(linspace(0, N, B+1), arange(N), sort(conf))``, i.e.
``e_k = s_j + (x - j)(s_{j+1} - s_j)`` at ``x = kN/B``, ``j = ⌊x⌋`` (``e_k = s_{N-1}`` once
``x >= N-1``; so ``e_0`` is the minimum and ``e_B`` the maximum), interpolated in float64;
bin ``b`` holds ``e_b < conf <= e_{b+1}`` compared in the confidences' dtype (the published
code compares float32 confidences with the edges rounded to float32), so validation samples
equal to the minimum are in no bin; and every bin, empty ones included, goes through steps
3-5 (an empty bin has ``d_b = 0``, so only the sign switch and the clip can move its γ).  The
new bin ranges are the interpolated interior edges (0 and 1 at the ends; the lookup below
never reads them).  The per-bin means are computed in float64 (the published code averages
float32 values, a difference of order 1e-7 in ``d_b``).  The default ``edges="equal_mass"``
is unchanged; the two differ by up to about 1e-2 in the edges at N = 5,000 and by more on
small or tied validation sets.

Empty bins and small validation sets.  A bin that receives no validation sample has no evidence:
its ``γ_b`` is kept exactly (``d_b = 0`` as in the paper's rule, and it is not touched by the
sign switch either; the two only differ when ``|gamma_init| < switch_point`` was chosen and the bin
has never been updated).  Equal-mass bins are only empty when there are ties or fewer
validation samples ``N`` than bins (``N < B``: ``e_k = s_{max(⌊kN/B⌋-1, 0)}`` repeats values,
so some bins have zero width); this is allowed, those bins keep their γ and, having zero width,
are never chosen by a training sample.  At least one validation sample is required.

Loss (:meth:`AdaFocalLoss.forward`): a training sample picks its bin by its **true-class**
probability ``p_y`` (detached, from the same ``log_softmax`` as the loss) with the left-closed
lookup ``#{k : e_k <= p_y}`` over the interior edges (below the first upper edge → bin 0, at or
above the last lower edge → bin ``B-1``, else ``lower <= p_y < upper``), then

.. math::
    \ell_i = \begin{cases} -(1-p_{y_i})^{\gamma_{b(i)}} \log p_{y_i} & \gamma_{b(i)} \ge 0 \\
             -(1+p_{y_i})^{|\gamma_{b(i)}|} \log p_{y_i} & \gamma_{b(i)} < 0 \end{cases}

computed by the signed focal loss of :mod:`torchcal.functional` (exact, finite gradient at
``p_y = 1``; the published code's ``1e-20`` inside the power is not needed).

Distributed.  When ``torch.distributed`` is initialised (world size > 1), :meth:`AdaFocalLoss.update`
gathers every rank's validation confidences and correctness (``all_gather`` with padding for
unequal shares), so each rank computes the same γ and edges as one process over the whole set.
Pass each rank's own share (this is what the trainer does), not the full set on every rank.
The per-bin statistics are computed from the sorted confidences, so the result does not depend
on sample order or on how the set is split between ranks (bit for bit on CPU).  The gather runs
on the logits' device (CPU tensors for gloo, CUDA tensors for NCCL).  The inputs are checked
before the gather and the outcome is shared (one small ``all_reduce``): if any rank's
validation logits or labels are invalid, every rank raises and none changes its state, instead
of the valid ranks waiting in the gather until the process-group timeout.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .._validation import Interval, Options, as_tensor, check_finite, check_labels
from ..functional.blocks import check_loss_args, no_autocast, reduce_loss, target_log_probs
from ..functional.focal import signed_focal_terms
from ..metrics.binning import bin_index, equal_mass_edges, equal_width_edges
from ..metrics.distributed import all_gather_uneven, world_size
from ._registry import register_loss
from .base import ANY_NUMBER, NON_NEGATIVE, POSITIVE, POSITIVE_INT, CalibrationLoss

__all__ = ["AdaFocalLoss", "adafocal_gamma_update", "published_equal_mass_edges",
           "published_equal_mass_bins", "EDGES"]

#: The two equal-mass edge definitions of :class:`AdaFocalLoss` (``edges=``).
EDGES = ("equal_mass", "published")


def adafocal_gamma_update(
    gammas: torch.Tensor, gaps: torch.Tensor, *, lam: float = 1.0, switch_point: float = 0.2,
    gamma_min: float = -2.0, gamma_max: float = 20.0, counts: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""One AdaFocal γ step per bin (steps 3-5 of the module docstring), vectorised.

    .. math::
        \gamma' = \gamma \exp(\operatorname{sign}^{+}(\gamma)\,\lambda d), \quad
        \gamma' \leftarrow \mp S_{th} \text{ if } |\gamma'| < S_{th}, \quad
        \gamma' \leftarrow \operatorname{clip}(\gamma', \gamma_{min}, \gamma_{max})

    with ``sign⁺(γ) = +1`` for ``γ > 0`` and ``-1`` otherwise; the switch sets ``-S_th`` when the
    pre-switch γ' is positive and ``+S_th`` otherwise.

    Args:
        gammas: current γ per bin, shape (B,).
        gaps: signed gaps ``d_b = conf_b - acc_b``, shape (B,).
        lam: step size λ >= 0.
        switch_point: ``S_th > 0``.
        gamma_min: lower clip.
        gamma_max: upper clip.
        counts: optional samples per bin (B,); bins with count 0 keep their γ exactly.

    Returns:
        The new γ per bin, shape (B,), in ``gammas``' dtype.

    Example:
        >>> g = torch.tensor([1.0, 1.0, 0.21, -0.5, 19.0, -1.9], dtype=torch.float64)
        >>> d = torch.tensor([0.1, 0.0, -0.1, 0.1, 0.2, -0.1], dtype=torch.float64)
        >>> [round(v, 4) for v in adafocal_gamma_update(g, d).tolist()]  # grow, keep, flip, ...
        [1.1052, 1.0, -0.2, -0.4524, 20.0, -2.0]
    """
    d = gaps.to(gammas.dtype)
    new = gammas * torch.exp(torch.where(gammas > 0, lam * d, -lam * d))
    switched = torch.where(new > 0, torch.full_like(new, -switch_point),
                           torch.full_like(new, switch_point))
    new = torch.where(new.abs() < switch_point, switched, new)
    new = new.clamp(gamma_min, gamma_max)
    if counts is not None:
        new = torch.where(counts.to(new.device) > 0, new, gammas)
    return new


def published_equal_mass_edges(sorted_conf: torch.Tensor, n_bins: int) -> torch.Tensor:
    r"""The published AdaFocal / focal-calibration equal-mass edges (``B + 1`` values, float64).

    ``np.interp(np.linspace(0, N, B + 1), np.arange(N), s)`` for the sorted values ``s``:
    ``x_k = k·(N/B)``, ``j = ⌊x_k⌋``, ``e_k = (s_{j+1} - s_j)(x_k - j) + s_j`` in float64, and
    ``e_k = s_{N-1}`` where ``x_k >= N - 1`` (the same operations as NumPy's ``interp``).

    Example:
        >>> s = torch.tensor([0.26, 0.53, 0.61, 0.75, 0.94, 0.99], dtype=torch.float64)
        >>> published_equal_mass_edges(s, 3)  # x = 0, 2, 4, 6
        tensor([0.2600, 0.6100, 0.9400, 0.9900], dtype=torch.float64)
        >>> published_equal_mass_edges(s, 4)[1:3]  # x = 1.5, 3: 0.53 + 0.5·0.08, then 0.75
        tensor([0.5700, 0.7500], dtype=torch.float64)
    """
    s = sorted_conf.to(torch.float64)
    n = s.shape[0]
    x = torch.arange(n_bins + 1, dtype=torch.float64, device=s.device) * (n / n_bins)
    j = torch.clamp(torch.floor(x), max=n - 1).long()
    j1 = torch.clamp(j + 1, max=n - 1)
    slope = s[j1] - s[j]
    inner = slope * (x - j.to(torch.float64)) + s[j]
    return torch.where(x >= n - 1, s[n - 1].expand_as(x), inner)


def published_equal_mass_bins(
    conf: torch.Tensor, n_bins: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bins of the published equal-mass binning: ``(edges (B+1,) float64, bin (N,), kept (N,))``.

    ``edges`` from :func:`published_equal_mass_edges`; value ``x`` is in bin ``b`` when
    ``e_b < x <= e_{b+1}``, compared in ``conf``'s dtype (the published code compares float32
    confidences with the edges rounded to float32); ``kept`` is False for the values equal to
    the minimum ``e_0``, which are in no bin.

    Example:
        >>> conf = torch.tensor([0.2, 0.9, 0.2, 0.5], dtype=torch.float64)
        >>> edges, idx, kept = published_equal_mass_bins(conf, 2)
        >>> edges.tolist(), idx.tolist(), kept.tolist()  # the two 0.2 (the minimum) are dropped
        ([0.2, 0.5, 0.9], [0, 1, 0, 0], [False, True, False, True])
    """
    edges = published_equal_mass_edges(torch.sort(conf).values, n_bins)
    cmp = edges.to(conf.dtype)
    return edges, bin_index(conf, cmp[1:-1]), conf > cmp[0]


def _collective_device(t: Any) -> torch.device:
    """Device for a collective: the tensor's own, else the process group's default."""
    if isinstance(t, torch.Tensor):
        return t.device
    if dist.get_backend() == "nccl":  # pragma: no cover - needs CUDA
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@register_loss("adafocal", display="AdaFocal", order=11,
               paper="Ghosh et al. 2022, *AdaFocal: Calibration-aware Adaptive Focal Loss* "
                     "(NeurIPS)", tags={"demo"})
class AdaFocalLoss(CalibrationLoss):
    r"""AdaFocal: focal / inverse-focal loss with one γ per confidence bin, updated from
    validation calibration (see the module docstring for every rule and convention).

    Args:
        n_bins: number of bins ``B`` (15).
        lam: update step λ >= 0 (1.0).
        gamma_init: initial γ of every bin, in ``[gamma_min, gamma_max]`` (1.0: the first epoch
            is FL-1).
        gamma_max: upper clip of γ (20.0).
        gamma_min: lower clip of γ (-2.0; negative γ means inverse focal with ``|γ|``).
        switch_point: ``S_th > 0`` (0.2): a γ that would fall inside ``(-S_th, S_th)`` switches
            sign to ``∓S_th``.
        update_every: ``None`` (one update per epoch, after validation) or a number of training
            batches between updates; read by the trainer.
        edges: ``"equal_mass"`` (default; torchcal's equal-mass bins, every validation sample
            in one bin) or ``"published"`` (the published code's interpolated edges, ties with
            the minimum dropped, empty bins updated: reproduces its γ trajectory; see the
            module docstring).
        reduction: ``"mean"``, ``"sum"`` (the published training) or ``"none"``.
        ignore_index: target value to ignore.
        validate_args: check the training targets' range on every call (see
            :class:`~torchcal.losses.CalibrationLoss`).

    Attributes:
        gammas: float64 buffer (B,), the current γ per bin.
        bin_edges: float64 buffer (B+1,), ``0 = e_0 <= ... <= e_B = 1``.
        history: list with one dict per update: ``gammas`` and ``bin_edges`` after the update,
            the validation ``gaps`` (d_b) and ``counts`` per bin (CPU tensors, copied from
            the device when read).  It is kept as one preallocated float64 tensor of
            ``4B + 1`` columns per update on the state's device (:attr:`history_tensor`),
            written in place by an update (no host copy) and saved as that one tensor, so a
            snapshot and save cost about the same at 0 or 3,500 updates.

    Shapes: ``input`` (N, C) or (N, C, d1, ...) logits, ``target`` (N,) or (N, d1, ...) class
    indices; the output is a scalar, or of ``target``'s shape for ``reduction="none"``.

    Example:
        >>> loss = AdaFocalLoss(n_bins=2)
        >>> x = torch.tensor([[0.0, 0.0]])
        >>> loss(x, torch.tensor([0]))  # γ = 1 before any update: 0.5 * log 2
        tensor(0.3466)
        >>> loss.update(logits=torch.tensor([[2.0, 0.0], [0.0, 3.0], [1.0, 0.0], [0.0, 4.0]]),
        ...             labels=torch.tensor([1, 1, 0, 1]))
        >>> loss.gammas
        tensor([1.3579, 0.9678], dtype=torch.float64)
        >>> loss.bin_edges
        tensor([0.0000, 0.8808, 1.0000], dtype=torch.float64)
    """

    wants_validation = True
    validation_call = "update"
    #: the history tensor is state ``forward`` never reads (not stacked by a pack)
    unread_state = ("_hist",)
    missing_validation_effect = "AdaFocal stays focal loss with γ = gamma_init in every bin"
    n_bins: int
    lam: float
    gamma_init: float
    gamma_max: float
    gamma_min: float
    switch_point: float

    _parameter_constraints = {
        "n_bins": POSITIVE_INT, "lam": NON_NEGATIVE, "gamma_init": ANY_NUMBER,
        "gamma_max": ANY_NUMBER, "gamma_min": ANY_NUMBER, "switch_point": POSITIVE,
        "update_every": Interval(int, 1, None, allow_none=True), "edges": Options(EDGES),
    }

    def __init__(
        self,
        n_bins: int = 15,
        lam: float = 1.0,
        gamma_init: float = 1.0,
        gamma_max: float = 20.0,
        gamma_min: float = -2.0,
        switch_point: float = 0.2,
        update_every: int | None = None,
        edges: str = "equal_mass",
        reduction: str = "mean",
        ignore_index: int = -100,
        validate_args: bool = True,
    ) -> None:
        super().__init__(n_bins=n_bins, lam=lam, gamma_init=gamma_init, gamma_max=gamma_max,
                         gamma_min=gamma_min, switch_point=switch_point,
                         update_every=update_every, edges=edges, reduction=reduction,
                         ignore_index=ignore_index, validate_args=validate_args)
        if not self.gamma_min < self.gamma_max:
            raise ValueError(
                f"Expected `gamma_min` < `gamma_max`, got gamma_min={self.gamma_min!r}, "
                f"gamma_max={self.gamma_max!r}"
            )
        if not self.gamma_min <= self.gamma_init <= self.gamma_max:
            raise ValueError(
                f"Expected `gamma_init` to be in [gamma_min, gamma_max] = [{self.gamma_min}, "
                f"{self.gamma_max}], got {self.gamma_init!r}"
            )
        self.register_buffer(
            "gammas", torch.full((self.n_bins,), self.gamma_init, dtype=torch.float64)
        )
        self.register_buffer("bin_edges", equal_width_edges(self.n_bins, dtype=torch.float64))
        self._hist: torch.Tensor | None = None  # (capacity, 4B + 1): rows [:_n] are the history
        self._n = 0

    # ------------------------------------------------------------------ loss
    def bin_of(self, p_y: torch.Tensor) -> torch.Tensor:
        """Bin index of true-class probabilities (left-closed lookup on the interior edges).

        >>> AdaFocalLoss(n_bins=4).bin_of(torch.tensor([0.0, 0.25, 0.2499, 0.75, 1.0]))
        tensor([0, 1, 0, 3, 3])
        """
        return bin_index(p_y, self.bin_edges[1:-1], right_closed=False)

    def _gamma_of(self, lp: torch.Tensor) -> torch.Tensor:
        """Per-sample γ from (detached) true-class log-probabilities."""
        idx = self.bin_of(lp.detach().exp())
        g = self.gammas.to(device=lp.device, dtype=lp.dtype)
        return g.index_select(0, idx.reshape(-1)).reshape(idx.shape)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Signed focal loss with each sample's γ picked by the bin of its ``p_y``.

        Args:
            input: logits (N, C) or (N, C, d1, ...), any floating dtype (computed in float32,
                float64 stays float64).
            target: class indices (N,) or (N, d1, ...); ``ignore_index`` entries contribute 0.

        Returns:
            A scalar for ``"mean"``/``"sum"``, else per-entry losses of ``target``'s shape.
        """
        check_loss_args(input, target, self.reduction)
        with no_autocast(input):
            # γ is picked from the very log p_y the loss uses (one log_softmax); the state is
            # read as tensors, so a compiled forward is not recompiled when it changes.
            _, lp, _, valid = target_log_probs(input, target, self.ignore_index,
                                               validate_args=self.validate_args)
            loss = signed_focal_terms(lp, self._gamma_of(lp))
            return reduce_loss(loss, valid, self.reduction)

    # ---------------------------------------------------------------- update
    def _validation_stats(
        self, logits: Any, labels: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z = as_tensor(logits, "logits")
        if not z.is_floating_point():
            raise TypeError(f"Expected `logits` to be a floating-point tensor, got {z.dtype}")
        if z.ndim != 2 or z.shape[1] < 2:
            raise ValueError(
                f"Expected `logits` of shape (N, C) with C >= 2, got shape {tuple(z.shape)}"
            )
        y = check_labels(labels, n=z.shape[0], num_classes=z.shape[1], device=z.device)
        check_finite(z, "logits")
        cd = torch.float64 if z.dtype == torch.float64 else torch.float32
        with torch.no_grad(), no_autocast(z):
            zc = z.detach().to(cd)
            top, pred = zc.max(dim=1)
            conf = torch.exp(top - torch.logsumexp(zc, dim=1))
            correct = (pred == y).to(cd)
        return conf, correct

    @torch.no_grad()
    def update(self, *, logits: Any, labels: Any, sync_dist: bool = True) -> None:
        """Move γ per bin from validation outputs and adopt the validation equal-mass edges.

        Args:
            logits: validation logits (N, C) of this process (tensor or NumPy array).
            labels: validation class indices (N,).
            sync_dist: under an initialised ``torch.distributed`` group, gather every rank's
                share first (default True; set False only if each rank already passes the
                whole validation set).  The gather is a collective: every rank must call
                ``update`` (a rank with no validation samples passes empty tensors).

        Raises:
            ValueError: on a shape mismatch, NaN/Inf logits, labels out of range, or no
                validation sample at all; under ``torch.distributed`` every rank raises when
                any rank's input is bad (instead of the others waiting in the gather), and no
                rank changes its state.
        """
        conf, correct = self._gathered_stats(logits, labels, sync_dist)
        if conf.numel() == 0:
            raise ValueError("Expected at least one validation sample, got 0")
        interior, gaps, counts = self._bin_gaps(conf, correct)
        self._adopt(interior, gaps, counts)
        self._validation_received()

    def _gathered_stats(
        self, logits: Any, labels: Any, sync_dist: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Validated (confidence, correct) of this rank, or of every rank under distributed."""
        distributed = sync_dist and world_size() > 1
        try:
            conf, correct = self._validation_stats(logits, labels)
            error: Exception | None = None
        except (TypeError, ValueError) as e:
            if not distributed:
                raise
            conf = correct = None
            error = e
        if distributed:
            # one small collective so that a bad input on one rank fails every rank
            flag = torch.tensor([0 if error is None else 1], dtype=torch.int32,
                                device=_collective_device(logits))
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if error is not None:
                raise error
            if int(flag.item()):
                raise ValueError(
                    "AdaFocal update: the validation logits/labels of another rank were "
                    "invalid (see that rank's error); no rank changed its state"
                )
            packed = all_gather_uneven(
                torch.stack([conf.double(), correct.double()], 1).reshape(-1))
            packed = packed.reshape(-1, 2)
            conf, correct = packed[:, 0].to(conf.dtype), packed[:, 1].to(conf.dtype)
        return conf, correct

    def _bin_gaps(
        self, conf: torch.Tensor, correct: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Interior equal-mass edges, per-bin (conf - acc) gaps and float64 counts."""
        # Sorted order makes the per-bin sums independent of sample order and rank split.
        order = torch.argsort(conf, stable=True)
        conf_s = conf[order]
        correct_s = correct[order]
        if self.edges == "published":  # ties with the minimum are in no bin (kept = 0)
            full, idx, kept = published_equal_mass_bins(conf_s, self.n_bins)
            interior, kept = full[1:-1], kept.to(torch.float64)
        else:
            interior = equal_mass_edges(conf_s, self.n_bins)
            idx = bin_index(conf_s, interior)
            kept = torch.ones_like(conf_s, dtype=torch.float64)
        b = self.n_bins
        counts = torch.zeros(b, dtype=torch.float64, device=conf.device).index_add_(0, idx, kept)
        conf_sum = torch.zeros(b, dtype=torch.float64, device=conf.device).index_add_(
            0, idx, conf_s.double() * kept)
        acc_sum = torch.zeros(b, dtype=torch.float64, device=conf.device).index_add_(
            0, idx, correct_s.double() * kept)
        denom = counts.clamp_min(1.0)
        gaps = torch.where(counts > 0, (conf_sum - acc_sum) / denom, torch.zeros_like(counts))
        return interior, gaps, counts

    def _adopt(self, interior: torch.Tensor, gaps: torch.Tensor, counts: torch.Tensor) -> None:
        """Move γ by the gaps, adopt the new edges and append a history record."""
        dev = self.gammas.device
        new_gammas = adafocal_gamma_update(
            self.gammas, gaps.to(dev), lam=self.lam, switch_point=self.switch_point,
            gamma_min=self.gamma_min, gamma_max=self.gamma_max,
            counts=None if self.edges == "published" else counts.to(dev),
        )
        self.gammas.copy_(new_gammas)
        edges = torch.cat([
            torch.zeros(1, dtype=torch.float64, device=dev),
            interior.to(device=dev, dtype=torch.float64),
            torch.ones(1, dtype=torch.float64, device=dev),
        ])
        self.bin_edges.copy_(edges)
        self._append(torch.cat([self.gammas, self.bin_edges,
                                gaps.to(device=dev, dtype=torch.float64),
                                counts.to(device=dev, dtype=torch.float64)]))

    # --------------------------------------------------------------- history
    _WIDTHS = ("gammas", "bin_edges", "gaps", "counts")

    def _columns(self) -> dict[str, slice]:
        b = self.n_bins
        return {"gammas": slice(0, b), "bin_edges": slice(b, 2 * b + 1),
                "gaps": slice(2 * b + 1, 3 * b + 1), "counts": slice(3 * b + 1, 4 * b + 1)}

    def _append(self, row: torch.Tensor) -> None:
        """Write one history row in place (the capacity doubles when full: O(1) amortised,
        on the device, no host copy)."""
        h = self._hist
        if h is None or h.device != row.device or self._n == h.shape[0]:
            cap = 64 if h is None else max(64, 2 * h.shape[0] if self._n == h.shape[0]
                                           else h.shape[0])
            new = torch.empty(cap, row.shape[0], dtype=torch.float64, device=row.device)
            if self._n:
                new[:self._n].copy_(h[:self._n])
            self._hist = h = new
        h[self._n].copy_(row)
        self._n += 1

    @property
    def history_tensor(self) -> torch.Tensor:
        """The history as one (updates, 4B + 1) float64 tensor on the state's device (a view:
        columns ``gammas`` [0, B), ``bin_edges`` [B, 2B+1), ``gaps`` [2B+1, 3B+1), ``counts``
        [3B+1, 4B+1))."""
        if self._hist is None:
            return torch.zeros(0, 4 * self.n_bins + 1, dtype=torch.float64,
                               device=self.gammas.device)
        return self._hist[:self._n]

    @property
    def history(self) -> list[dict[str, torch.Tensor]]:
        """One dict per update (``gammas``, ``bin_edges``, ``gaps`` float64, ``counts``
        int64, CPU tensors), read from :attr:`history_tensor` with one host copy."""
        h = self.history_tensor.detach().cpu()
        cols = self._columns()
        return [{k: (row[c].to(torch.int64) if k == "counts" else row[c])
                 for k, c in cols.items()} for row in h]

    def on_validation(self, *, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Trainer hook: :meth:`update` with this rank's validation outputs."""
        self.update(logits=logits, labels=labels)

    def log_state(self) -> dict[str, Any]:
        """The per-bin γ and the bin edges (as float32 lists) for the run's log (one host
        copy)."""
        both = torch.cat([self.gammas.detach(), self.bin_edges.detach()]).float().cpu().tolist()
        return {"gammas": both[:self.n_bins], "bin_edges": both[self.n_bins:]}

    def reset(self) -> None:
        """Back to the initial state (equal-width edges, ``gamma_init`` everywhere, no history)."""
        self.gammas.fill_(self.gamma_init)
        self.bin_edges.copy_(equal_width_edges(self.n_bins, dtype=torch.float64,
                                               device=self.bin_edges.device))
        self._hist, self._n = None, 0

    # ----------------------------------------------------------------- state
    def get_extra_state(self) -> dict[str, Any]:
        """``{"history": (updates, 4B + 1) float64 tensor}``: one tensor, whatever the number
        of updates (a copy: later updates do not change it)."""
        h = self._hist  # never requires grad: one slice and one copy
        return {"history": h[:self._n].clone() if h is not None else self.history_tensor}

    def set_extra_state(self, state: Any) -> None:
        """Restore the history: the one tensor :meth:`get_extra_state` saves, or the list of
        per-update dicts that torchcal saved before it."""
        h = state.get("history") if isinstance(state, dict) else None
        if isinstance(h, list):
            h = self._from_entries(h)
        width = 4 * self.n_bins + 1
        if isinstance(h, torch.Tensor) and h.ndim == 2 and h.shape[1] != width:
            # as load_state_dict words a buffer's mismatch (a state of another n_bins)
            raise RuntimeError(f"size mismatch for the AdaFocal history: copying rows of "
                               f"{h.shape[1]} values, the {self.n_bins} bins' rows have {width}")
        if not (isinstance(h, torch.Tensor) and h.ndim == 2):
            raise ValueError(
                "Expected the AdaFocal extra state to be a dict with a 'history' tensor of "
                f"shape (updates, {width}) (or a list of per-update dicts), got "
                f"{type(state).__name__ if not isinstance(state, dict) else type(h).__name__}"
                + (f" of shape {tuple(h.shape)}" if isinstance(h, torch.Tensor) else ""))
        if not (h.is_floating_point() and bool(torch.isfinite(h[:, :3 * self.n_bins + 1]).all())):
            raise ValueError("Expected the AdaFocal history to hold finite floating-point values")
        h = h.detach().to(device=self.gammas.device, dtype=torch.float64)
        self._hist, self._n = None, 0
        if h.shape[0]:
            self._hist = torch.empty(max(64, h.shape[0]), width, dtype=torch.float64,
                                     device=h.device)
            self._hist[:h.shape[0]].copy_(h)
            self._n = int(h.shape[0])

    def _from_entries(self, entries: list[Any]) -> torch.Tensor:
        """The rows of the older per-update dicts."""
        rows = []
        for h in entries:
            if (not isinstance(h, dict) or set(h) != set(self._WIDTHS)
                    or not all(isinstance(v, torch.Tensor) for v in h.values())):
                raise ValueError("Expected every AdaFocal history entry to be a dict of tensors "
                                 f"{self._WIDTHS}")
            rows.append(torch.cat([h[k].detach().cpu().reshape(-1).to(torch.float64)
                                   for k in self._WIDTHS]))
        return (torch.stack(rows) if rows
                else torch.zeros(0, 4 * self.n_bins + 1, dtype=torch.float64))
