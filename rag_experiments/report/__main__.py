from rag_experiments.report.build.build import main

raise SystemExit(main())
