"""Host NUMA topology, NUMA-bound host memory, placement queries and affinity (installed as gh200rt.numa)."""
