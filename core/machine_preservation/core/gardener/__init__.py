"""Gardener's objects as the core reads and writes them: the seed's `Cluster` and the Shoot in it (`cluster`), the
Extension contract (`extension`), the extension's `providerConfig` (`provider_config`) and what the extension
provisions in each shoot (`shoot_resources`)."""
