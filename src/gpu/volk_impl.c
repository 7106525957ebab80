/*
 * volk_impl.c — compiles volk (Debian's libvulkan-volk-dev ships it as
 * source, /usr/include/volk.c): the Vulkan loader is opened at run time,
 * so libekv has no link-time dependency on libvulkan and runs on machines
 * without it (docs/architecture.md "Backends").
 */
#include <volk.c>
