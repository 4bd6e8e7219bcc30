// Boost.Process v2 is compiled once, here (BOOST_PROCESS_V2_SEPARATE_COMPILATION elsewhere).
#include <boost/process/v2/src.hpp>
