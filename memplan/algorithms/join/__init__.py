"""Join networks (Optimal Memory-aware Backpropagation of Deep Join Networks, Phil. Trans. R. Soc. A 2020): Siamese and cross-modal networks joined by a loss.

``join`` (the optimal canonical schedule, Theorem 3 of Beaumont, Herrmann, Pallez & Shilova) and
``equiv-chain`` (the paper's baseline). Uniform profiles are solved in the paper's pebble model
(:mod:`memplan.algorithms.join.pebble`), others in the chain model of docs/model.md on every branch
(:mod:`memplan.algorithms.join.hetero`); see docs/join.md. The family is declared in
:mod:`.entries`.
"""
