"""Code shared by torchfleet's modules; shipped to hosts inside each module's AnsiballZ."""
