"""Floor 1 of the torch layer: whose error it is (blame) and which device a profile is measured on."""
