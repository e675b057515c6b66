#include "version.h"

int mvc_native_abi_version(void) { return 10; }
