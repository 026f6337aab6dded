/* gpufleet test fixture: stand-in for libnvidia-container.so.1. */
const char *nvc_version(void) { return "@VERSION@"; }
