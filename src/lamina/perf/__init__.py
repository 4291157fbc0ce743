"""Performance models: this machine's measured rates, and the cost of derived-quantity strategies.

* :func:`calibrate` measures memory, kernel, statistics and storage rates;
  :func:`load_calibration` caches them (:mod:`lamina.perf.calibrate`);
* :func:`predict` and :func:`recommend` give the compute, write, read and
  total time and the storage of keeping a derived quantity as data
  (``store``), as block statistics only (``stats``) or as its expression
  only (``expression``), Eq. 1-3 of :mod:`lamina.perf.model`;
* :func:`main` is ``lamina model derived ...`` (:mod:`lamina.perf.command`).

>>> from lamina.perf import Calibration, recommend
>>> cal = Calibration(memcpy_bandwidth=2e10, kernel_bandwidth=1e10, stencil_bandwidth=5e9,
...                   flop_rate=1e9, stats_bandwidth=8e9, write_bandwidth=2e9,
...                   read_bandwidth=2e9, host="example", created=0.0)
>>> recommend("magnitude(vx, vy, vz)", (256, 256, 256), readers=0, calibration=cal)[0]
'expression'
"""

from typing import TYPE_CHECKING

from .. import lazy

# eager: the function ``calibrate`` shares its name with its module, which an import of
# ``lamina.perf.calibrate`` after this package's would otherwise bind here instead
from .calibrate import (
    CALIBRATION_VERSION,
    Calibration,
    calibrate,
    default_path,
    load_calibration,
    read_calibration,
    save_calibration,
)

if TYPE_CHECKING:
    from .command import main, parse_bandwidth
    from .model import STRATEGIES, Prediction, Terms, predict, recommend, terms

#: where each name below lives: imported at its first use (lamina.lazy): the model imports
#: the expression parser, the command argparse
_WHERE = {
    "main": ".command",
    "parse_bandwidth": ".command",
    "STRATEGIES": ".model",
    "Prediction": ".model",
    "Terms": ".model",
    "predict": ".model",
    "recommend": ".model",
    "terms": ".model",
}

__getattr__ = lazy.getattr_for(__name__, _WHERE, globals())


__all__ = [
    "CALIBRATION_VERSION",
    "Calibration",
    "Prediction",
    "STRATEGIES",
    "Terms",
    "calibrate",
    "default_path",
    "load_calibration",
    "main",
    "parse_bandwidth",
    "predict",
    "read_calibration",
    "recommend",
    "save_calibration",
    "terms",
]
