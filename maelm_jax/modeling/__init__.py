"""The model: encoder, decoders, attention kernels, relative positions, masking, parameter layouts, and the FLOP model."""
