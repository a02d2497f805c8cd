"""`python -m entropix_mlx`: the same app as the `entropix-mlx` script."""

from .cli.app import main

if __name__ == "__main__":
    main()
