"""The math: features, encoder, transducer heads, decoding, and the kernels and graphs beside them."""
