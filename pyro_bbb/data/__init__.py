"""Data sets for examples, tests and benchmarks, as torch tensors; nothing is downloaded.

* :mod:`~pyro_bbb.data.toy`: the 1-D regression problem with a gap (:func:`gap_regression`);
* :mod:`~pyro_bbb.data.classification`: scikit-learn's 8×8 digits (:func:`digits`) and its
  continual-learning task sequences (:func:`split_digits`, :func:`permuted_digits`);
* :mod:`~pyro_bbb.data.uci`: the UCI split-folder format (:func:`load_uci`,
  :func:`write_uci_folder`); :mod:`~pyro_bbb.data.uci_folder`: every split of a set,
  standardised (:func:`load_uci_folder`);
* :mod:`~pyro_bbb.data.idx`: image folders in MNIST's idx format, such as Fashion-MNIST
  (:func:`load_idx`, :func:`image_folder`, :func:`image_split`);
* :mod:`~pyro_bbb.data.standardize`: :class:`Standardizer`.

Nothing here imports Pyro or trains a model.
"""

from .classification import Split, digits, permuted_digits, split_digits
from .idx import (
    FASHION_MNIST,
    FASHION_MNIST_CLASSES,
    ImageData,
    image_folder,
    image_split,
    load_idx,
)
from .standardize import Standardizer
from .toy import ToyData, gap_function, gap_regions, gap_regression
from .uci import find_uci_folders, load_uci, uci_num_splits, write_uci_folder
from .uci_folder import UCIFolder, UCISplit, load_uci_folder

__all__ = [
    "FASHION_MNIST",
    "FASHION_MNIST_CLASSES",
    "ImageData",
    "Split",
    "Standardizer",
    "ToyData",
    "UCIFolder",
    "UCISplit",
    "digits",
    "find_uci_folders",
    "gap_function",
    "gap_regions",
    "gap_regression",
    "image_folder",
    "image_split",
    "load_idx",
    "load_uci",
    "load_uci_folder",
    "permuted_digits",
    "split_digits",
    "uci_num_splits",
    "write_uci_folder",
]
