"""The engine every dt-conv op runs on: the plan from global metadata (`plan`, over the
torch-free index arithmetic of `geometry`), the halo exchange and its adjoint (`halo`),
a rank's window and the window-op recipe (`windows`), exchanges overlapped with compute
(`overlap`), and partial results summed over the mesh (`partial_sums`). The ops (`ops`)
add only their own geometry and local compute on top."""
