"""The entropix-mlx terminal app (Typer + Rich). Thin: all logic is in entropix_mlx."""
