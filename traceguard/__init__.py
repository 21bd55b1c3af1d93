"""traceguard: is our GPU-to-GPU communication healthy, and if not, why?"""

__version__ = "0.1.0"
