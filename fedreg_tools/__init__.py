"""The research tools around the app: experiment runner, reports, replay, launcher, data
converter. Never sent to a device: the FAB carries fedreg_app, strategies and clients."""
