#include "tandem/version.h"

#include "tandem_version_config.h"

namespace tandem {

const char* version() { return TANDEM_VERSION; }
const char* built_with_torch_version() { return TANDEM_TORCH_VERSION; }
bool built_with_cuda() { return TANDEM_BUILT_WITH_CUDA != 0; }

}  // namespace tandem
