"""The demo task: real handwritten digits and a generated CIFAR-shaped set, plus a small conv net.

Nothing here downloads anything: the digits ship with scikit-learn and the shapes are drawn by the code.
"""

from lightning_speedups.demo.data import DigitsDataModule, ShapesDataModule, ShapesDataset, load_digits_tensors
from lightning_speedups.demo.model import DemoClassifier, DemoMLP

__all__ = [
    "DigitsDataModule",
    "ShapesDataModule",
    "ShapesDataset",
    "load_digits_tensors",
    "DemoClassifier",
    "DemoMLP",
]
