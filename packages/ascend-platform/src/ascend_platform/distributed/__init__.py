"""Device communication for the Ascend platform."""
