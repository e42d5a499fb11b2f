"""The paper's Table 3 (language modelling) re-run at a preset: the driver and its data."""
