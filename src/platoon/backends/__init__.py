"""Training backends that platoon runs itself."""
