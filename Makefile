# Wraps the README's two commands and the usual build.
.PHONY: all demo test build clean
all: build
build:
	./scripts/build.sh build
demo:
	./scripts/demo.sh
test:
	./scripts/test.sh
clean:
	rm -rf build build-asan build-tsan
