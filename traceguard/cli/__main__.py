"""``python -m traceguard.cli``: the same as the ``traceguard`` console script."""

from traceguard.cli import console_main

if __name__ == "__main__":
    console_main()
