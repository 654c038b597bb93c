/* A stand-in for a host process's own C++ runtime that the library must never call into.
 *
 * Preloaded (LD_PRELOAD), it defines C++ runtime functions the library formats its messages with
 * (std::string growth, std::ostream number output, std::locale). A library that binds its C++
 * runtime at load time lands here, as it landed in an uninitialized copy of the runtime inside
 * PyTorch and JAX processes; this copy says so and aborts. Written in C: the mangled names are
 * plain identifiers, and the test links no C++ runtime of its own. */
#include <stdio.h>
#include <stdlib.h>

static void reached(const char* what) {
  fprintf(stderr, "hostile host: the library called the host's %s\n", what);
  abort();
}

#define HOSTILE(mangled, readable) \
  void mangled(void) {             \
    reached(readable);             \
  }

HOSTILE(_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm,
        "std::string::_M_create")
HOSTILE(_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_appendEPKcm,
        "std::string::_M_append")
HOSTILE(_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE10_M_replaceEmmPKcm,
        "std::string::_M_replace")
HOSTILE(_ZNSo9_M_insertIlEERSoT_, "std::ostream::_M_insert<long>")
HOSTILE(_ZNSo9_M_insertImEERSoT_, "std::ostream::_M_insert<unsigned long>")
HOSTILE(_ZNSo9_M_insertIdEERSoT_, "std::ostream::_M_insert<double>")
HOSTILE(_ZNSt6localeC1Ev, "std::locale::locale()")
