"""The :class:`Reduction` interface: what a summary recorded with
``Recorder.record(..., reduce=...)`` is. A reduction says what it is called (its ``kind``,
stored in the array's attributes, and the suffix :func:`hostfeed.capture` adds to a name),
what a row holds (its shape after the kept axes, its dtype, its columns' description), how
JAX computes it, which native kernel of the core computes it where the transport uses them,
and, as a :class:`Readback`, how its rows read back: what ``python -m hostfeed show``
draws of them and what the TensorBoard export writes (:meth:`Readback.board`).

The implementations and their registry are in :mod:`hostfeed._src.reductions`; recording,
capture, resume, ``show`` and the TensorBoard export know a reduction only through this
interface (raw arrays, which no reduction wrote, read back as
:class:`~.stats.Raw` says).
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Optional

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Reduction", "Readback", "Board", "Histo", "Pane", "ordered_keys", "keys",
           "per_shard_sum"]

#: The styles ``show`` draws a reduction's rows in (:attr:`Reduction.plot`): ``"stats"``
#: (the rows' statistics, as ``reduce="stats"`` and raw arrays: the plots its
#: :attr:`Reduction.panes` say), ``"heatmap"`` (steps by columns, ``log10(1 + value)``,
#: as a histogram, with a colour bar) and ``"lines"`` (one line per column).
PLOTS = ("stats", "heatmap", "lines")


@dataclass(frozen=True)
class Pane:
    """One plot of a panel of statistics as ``show`` draws it, stacked with the others of
    :attr:`Reduction.panes`, each on its own y axis: ``label`` beside it, the columns in
    ``lines`` (by name) as lines over the steps, those in ``dashed`` dashed, a band of
    ``band[0]`` plus and minus ``band[1]``; ``positive``: magnitudes (a log axis where they
    span decades); ``height``: its share of the panel's height; ``optional``: drawn only
    where one of its lines is not 0 (a pane of rare events). A line may also name what
    statistics give (``reductions.stats.derived``: fractions drawn in percent); a line whose values
    a row lacks (an older store's) is left out, and a pane left with none."""
    label: str
    lines: tuple[str, ...]
    dashed: tuple[str, ...] = ()
    band: Optional[tuple[str, str]] = None
    positive: bool = False
    height: float = 1.0
    optional: bool = False


#: One TensorBoard histogram: ``(min, max, bucket_limit, bucket, sum, sum_squares)`` (as
#: TensorBoard's ``HistogramProto``: bucket ``i`` runs from ``bucket_limit[i - 1]`` to
#: ``bucket_limit[i]``, the first from ``min``, the last to ``max``).
Histo = tuple[float, float, list[float], list[float], float, float]


@dataclass(frozen=True)
class Board:
    """What the TensorBoard export writes of a block of ``n`` rows of an array ``NAME``
    (:meth:`Readback.board`): ``scalars``, a scalar ``NAME/LABEL`` per label (``[n]``
    values each, in the order given); ``histograms``, a histogram ``NAME`` per row (None:
    none for that row); ``value``, rows of one value each, written as the scalar ``NAME``
    itself."""
    scalars: Mapping[str, np.ndarray] = field(default_factory=dict)
    histograms: Optional[Sequence[Optional[Histo]]] = None
    value: Optional[np.ndarray] = None


class Readback:
    """How an array's rows read back: what ``python -m hostfeed show`` draws of them (a
    panel, as :attr:`plot` says) and what the TensorBoard export writes
    (:meth:`board`). Every :class:`Reduction` is one, found by the kind its array's
    attributes name; raw rows have their own (:class:`~.stats.Raw`). Class methods: a
    store gives a kind and attributes, not an instance."""

    #: The kind stored in the array's attributes (``hostfeed.reduce.kind``).
    kind: ClassVar[str]
    #: How ``show`` draws the rows (one of :data:`PLOTS`).
    plot: ClassVar[str] = "lines"
    #: For ``plot = "stats"``: the plots of a panel, top to bottom (:class:`Pane`), over
    #: the lines :meth:`named` gives.
    panes: ClassVar[tuple[Pane, ...]] = ()
    #: The columns (by their label: :meth:`board`'s scalars) that the TensorBoard export
    #: writes only from the first row where they leave their quiet value (``None``: the
    #: first row's), with the quiet stretch before it as its first and last rows: a count
    #: that never changes, a NaN count that stays 0, is no tag of its own.
    quiet: ClassVar[Mapping[str, Optional[float]]] = {}

    @classmethod
    def plot_rows(cls, rows: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
        """What ``show`` draws of ``rows`` (``[n, kept..., *row_shape]`` as stored, with
        the array's ``hostfeed.reduce`` attributes): one row per recorded row,
        ``[n, columns]`` (float64 or float32): a line each (``"lines"``), a heat map's
        column (``"heatmap"``), what :meth:`named` names (``"stats"``)."""
        n = rows.shape[0]
        return np.asarray(rows, np.float64).reshape(n, -1)

    @classmethod
    def plot_labels(cls, attrs: dict[str, Any], columns: int) -> list[str]:
        """The names of :meth:`plot_rows`' columns (a legend, TensorBoard's tags)."""
        return [str(i) for i in range(columns)]

    @classmethod
    def plot_title(cls, attrs: dict[str, Any]) -> str:
        """What a panel of ``show`` says it draws."""
        return cls.kind

    @classmethod
    def named(cls, values: np.ndarray) -> dict[str, np.ndarray]:
        """The lines :attr:`panes` name, by name, of :meth:`plot_rows`' ``values`` (none
        without panes)."""
        return {}

    @classmethod
    def scalar(cls, values: np.ndarray) -> bool:
        """Whether ``values`` (:meth:`plot_rows`') are rows of one value each, drawn (and
        exported) as that value."""
        return False

    @classmethod
    def nonfinite_rows(cls, values: np.ndarray, attrs: dict[str, Any]) -> Optional[np.ndarray]:
        """Which rows held a NaN or an infinity (marked by ``show``), by :meth:`plot_rows`'
        ``values``; None: not known."""
        return None

    @classmethod
    def heatmap_edges(cls, attrs: dict[str, Any]) -> Optional[tuple[list[float], bool]]:
        """For ``plot = "heatmap"``: the y axis's edges (edge ``i`` the bottom of column
        ``i + 1`` of :meth:`plot_rows`) and whether they are of magnitudes on a log scale;
        None: the columns unlabelled."""
        return None

    @classmethod
    def board(cls, rows: np.ndarray, attrs: dict[str, Any]) -> Board:
        """What the TensorBoard export writes of ``rows`` (as :meth:`plot_rows` takes
        them): by default a scalar per column of :meth:`plot_rows`, named by
        :meth:`plot_labels`."""
        values = cls.plot_rows(rows, attrs)
        labels = cls.plot_labels(attrs, values.shape[1])
        return Board(scalars={label: values[:, j] for j, label in enumerate(labels)})


class Reduction(Readback, abc.ABC):
    """A summary computed on the device instead of the value (``reduce=``): over the axes
    reduced (``axis=``, all by default) each kept position gets a row of
    :meth:`row_shape` values of :attr:`dtype`.

    A subclass sets the class attributes and implements :meth:`compute` and
    :meth:`describe`; it is hashable (it is a parameter of JAX primitives) and added to
    the registry in ``reductions/__init__.py``.

    Example:
        >>> from hostfeed._src.reductions import Histogram, resolve
        >>> r = resolve(Histogram(4, (0.0, 1.0)), "x")
        >>> r.kind, r.suffix, r.row_shape(), r.dtype
        ('histogram', '.hist', (6,), dtype('int32'))
    """

    #: The kind stored in the array's attributes (``hostfeed.reduce.kind``); the
    #: registry's key, how ``show`` and resume find the reduction of an array.
    kind: ClassVar[str]
    #: What :func:`hostfeed.capture` appends to the name of an array it summarizes.
    suffix: ClassVar[str]
    #: The string that also names it as ``reduce=`` (``"stats"``), if one does.
    alias: ClassVar[Optional[str]] = None
    #: The core's XLA FFI target that computes it in one pass on the platforms the native
    #: transport has kernels for (it registers them: ``transports.register_kernel``),
    #: where the context's transport uses them (``native_kernels``) on one device's values
    #: and the reduced axes are the trailing ones; ``None``: the JAX operations of
    #: :meth:`compute` everywhere. The primitive of a reduction with a kernel is named
    #: after it.
    native_kernel: ClassVar[Optional[str]] = None

    @property
    @abc.abstractmethod
    def dtype(self) -> np.dtype:
        """The dtype of the values of a row."""

    @abc.abstractmethod
    def row_shape(self) -> tuple[int, ...]:
        """The shape of the row of each kept position (the stored row's trailing axes)."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """The JSON object stored as ``hostfeed.reduce`` in the array's attributes:
        ``kind`` and what a reader needs (the columns' names, a histogram's edges). The
        recorder adds ``axis``; a name keeps one description."""

    @abc.abstractmethod
    def compute(self, v: jax.Array, axes: tuple[int, ...]) -> jax.Array:
        """The reduction of ``v`` (float32, or what :meth:`value_dtype` says) over
        ``axes`` (sorted) in JAX operations: the kept axes in order, then
        :meth:`row_shape`."""

    def value_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype :meth:`compute` takes a value of ``dtype`` in: float32 (the
        default); a reduction that summarizes float64 values as they are says so."""
        return np.dtype(np.float32)

    def check(self, shape: tuple[int, ...], axes: tuple[int, ...], name: str) -> None:
        """Refuses, at trace time, a value of ``shape`` reduced over ``axes`` that this
        reduction cannot summarize (a clear error naming the record ``name``)."""
        return None

    def kernel_operands(self) -> list[np.ndarray]:
        """The constant operands :attr:`native_kernel` takes after the value."""
        return []

    def sharded(self, v: jax.Array, axes: tuple[int, ...],
                fn: Callable[[jax.Array, tuple[int, ...]], jax.Array]) -> jax.Array:
        """The reduction of ``v``, sharded in its type (explicit sharding): by default the
        JAX operations, which XLA partitions (each device reduces its slice). ``fn`` is
        how an unsharded slice is reduced (the native kernel where it applies)."""
        return self.compute(v, axes)

    @classmethod
    def nonfinite_columns(cls, attrs: dict[str, Any]) -> list[int]:
        """The columns of a row (its last axis, as ``attrs``, the array's
        ``hostfeed.reduce``, describes it) that count the non-finite values summarized: a
        non-zero count fires a recorder's non-finite trigger. None listed (the default): every
        value of the row is searched for a non-finite one instead."""
        return []

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Reduction) and type(other) is type(self)
                and self.describe() == other.describe())

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(sorted(self.describe().items()))))


def ordered_keys(x: np.ndarray) -> np.ndarray:
    """float32 values as int32 keys in the same order (``-0.0`` as ``0.0``; NaNs aside): a
    float comparison that no flush of subnormals to zero changes.

    Example:
        >>> ordered_keys(np.float32([-2.0, -1e-45, -0.0, 0.0, 1e-45, 2.0])).tolist()
        [-1073741825, -2, 0, 0, 1, 1073741824]
    """
    bits = np.asarray(x, np.float32).view(np.int32)
    keys = np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits)
    return np.where(keys == -1, 0, keys).astype(np.int32)


def keys(v: jax.Array) -> jax.Array:
    """:func:`ordered_keys` of a float32 JAX value (int32), or of a float64 one (int64)."""
    ints = jnp.int64 if v.dtype == jnp.float64 else jnp.int32
    bits = jax.lax.bitcast_convert_type(v, ints)
    key = jnp.where(bits < 0, bits ^ int(np.iinfo(ints).max), bits)
    return jnp.where(key == -1, 0, key)  # -0.0 is 0.0


def reduced_names(v: jax.Array, axes: tuple[int, ...]) -> tuple[tuple[Any, ...], list[str]]:
    """The partition spec of ``v`` (sharded in its type), one entry per axis, and the mesh
    axes the axes ``axes`` are sharded over."""
    spec = tuple(jax.typeof(v).sharding.spec)
    spec = spec + (None,) * (v.ndim - len(spec))
    names = [n for d in axes for n in ((spec[d],) if isinstance(spec[d], str) else
                                         (spec[d] or ()))]
    return spec, names


def per_shard_sum(fn: Callable[[jax.Array, tuple[int, ...]], jax.Array], v: jax.Array,
                  axes: tuple[int, ...], trailing: int = 1) -> jax.Array:
    """``fn(v, axes)``, a sum over ``axes``, of a value sharded in its type: computed on
    each device's slice and summed over the devices (``psum``) in a ``shard_map`` (JAX
    refuses a scatter with sharded indices there); its result has ``trailing`` axes after
    the kept ones."""
    from jax.sharding import PartitionSpec as P
    mesh = jax.typeof(v).sharding.mesh
    spec, names = reduced_names(v, axes)
    kept = [spec[d] for d in range(v.ndim) if d not in axes]

    def local(part: jax.Array) -> jax.Array:
        out = fn(part, axes)
        return jax.lax.psum(out, tuple(names)) if names else out

    return jax.shard_map(local, mesh=mesh, in_specs=P(*spec),
                         out_specs=P(*kept, *(None,) * trailing))(v)


def size(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
    """The number of values a row reduces."""
    return math.prod(shape[d] for d in axes)
