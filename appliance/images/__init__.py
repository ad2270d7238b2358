"""Engine images: a recipe becomes a build plan (context, content tag, patches, CA args) and a
streamed, cancellable Docker build."""
