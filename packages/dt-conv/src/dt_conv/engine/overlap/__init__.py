"""Halo exchanges overlapped with compute: a forward's blocks by stage (`forward`), a
backward's gradients during the exchanges (`backward`), and the Inductor pass that keeps
that order in compiled graphs (`graph_pass`)."""
