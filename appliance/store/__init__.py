"""The model store's plain logic (no Django): disk read rate, load-time prediction."""
