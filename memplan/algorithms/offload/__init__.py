"""GPU-CPU activation offloading (Beaumont, Eyraud-Dubois & Shilova, Euro-Par 2020).

The model of §3 (:mod:`.model`), its lower bound (:mod:`.lower_bound`), the no-wait ordered
schedule of a chosen set (:mod:`.nowait`) and the three algorithms that choose the set:
GREEDY (:mod:`.greedy`), DYNPROG (:mod:`.dynprog`) and VDNN (:mod:`.vdnn`); the family is declared
in :mod:`.entries`.
"""
