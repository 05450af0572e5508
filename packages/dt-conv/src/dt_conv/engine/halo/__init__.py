"""Halo exchange: which rows travel (`plan`), the all-to-all (`exchange`), the window a
rank gathers (`forward`) and its adjoint, gradients sent home (`backward`)."""
