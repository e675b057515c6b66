#ifndef MVC_VERSION_H
#define MVC_VERSION_H
/* ABI version of the native core; the Python side refuses a mismatched build. */
int mvc_native_abi_version(void);
#endif
