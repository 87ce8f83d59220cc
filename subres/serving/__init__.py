"""What every listening program needs: TLS, connection limits, errors, health, metrics, logs."""
