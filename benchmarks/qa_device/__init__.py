"""Table b on one lent GPU: the payload, the driver and its schedule (README.md beside this file)."""
