"""The Gardener extension, one process per seed: the Extension contract with gardenlet (`extensions`, `actuator`),
each shoot's access (`shoot_access`) and supervised lifecycle (`shoots`), and the seed-wide watches (`seed`)."""
