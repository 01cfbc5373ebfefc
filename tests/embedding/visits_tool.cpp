// The `idem` command line over a user's own projection: rebuild, consume, get, dump, stats, ...

#include "visits_projection.hpp"

#include <idem/cli/tool.hpp>

int main(int argc, char** argv) {
    idem::cli::tool tool{"visits-tool"};
    tool.consumer("visits-projector").add(visits());
    return tool.run(argc, argv);
}
