from draftlab.run import main

raise SystemExit(main())
