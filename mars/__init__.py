"""MARS (arXiv 2411.10438) and the Muon baseline as ``torch.optim`` optimizers; needs only torch."""
from mars.mars_m import MarsM, MarsMEfficient, Moonlight
from mars.muon import Muon
from mars.optimizer import MARS, available_backends

__all__ = ["MARS", "MarsM", "MarsMEfficient", "Moonlight", "Muon", "available_backends"]
