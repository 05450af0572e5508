"""dt-conv's ops, one module per op family over the engine (`dt_conv.engine`); a family
too large for one module is a subpackage split by direction (`conv`, `transposed`)."""
