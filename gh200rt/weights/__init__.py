"""Where a model's weights live, and the one owner that moves them.

- ``tiers.py``: the ``Tier`` enum and the staging-ring slot rule;
- ``forms.py``: the form an offloaded weight takes in host memory, and how it is rebuilt over storage;
- ``slabs.py`` / ``device_view.py``: host slabs (allocate on a NUMA node, register, view from the device);
- ``layer_slab.py``: one layer's weights laid out in one slab, bound over the slab, a slot or a device copy;
- ``schedule.py``: the staging ring's copy schedule, driven by the model runner's layer hooks;
- ``store.py``: ``WeightStore``, the only writer of ``WeightRef.current``, assembled from its parts:
  ``arena_runs.py`` (resident layers in runs of the device arena), ``layer_staging.py`` (the staging ring and
  the layer hooks), ``slab_building.py`` (host slabs), ``resident_forms.py`` (the CPU route's resident forms)
  and ``expert_placement.py`` (routed experts, with ``expert_slab.py`` and ``expert_staging.py``).
"""
