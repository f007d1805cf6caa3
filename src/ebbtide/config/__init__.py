"""Settings (from the environment) and the policy file schema."""
