"""What the algorithms stand on: run config, data, models, training, metrics, persistence,
checkpoints, client state, privacy. Imports nothing from the algorithms or the app."""
