"""The demo tasks: real handwritten digits and a generated CIFAR-shaped set with a small conv net, and standard-library
source code as byte tokens with a small transformer (for sequence batching).

Nothing here downloads anything: the digits ship with scikit-learn and the shapes are drawn by the code.
"""

from lightning_speedups.demo.data import DigitsDataModule, ShapesDataModule, ShapesDataset, load_digits_tensors
from lightning_speedups.demo.model import DemoClassifier, DemoMLP
from lightning_speedups.demo.text import StdlibCodeDataModule, StdlibCodeDataset, TextClassifier

__all__ = [
    "DigitsDataModule",
    "ShapesDataModule",
    "ShapesDataset",
    "load_digits_tensors",
    "DemoClassifier",
    "DemoMLP",
    "StdlibCodeDataModule",
    "StdlibCodeDataset",
    "TextClassifier",
]
