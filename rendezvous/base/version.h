// ctrun's version and the source revision it was built from, as `ctrun --version` and
// `ctrund --version` print them. Defined in a source the build writes (cmake/revision.cmake).
#pragma once

#include <string>

namespace ctrun {

// "0.1.0 (revision 0123456789ab)"; the revision ends in "-dirty" when the tree had uncommitted
// changes, and is "unknown" for a build outside a git checkout.
std::string version_text();

}  // namespace ctrun
